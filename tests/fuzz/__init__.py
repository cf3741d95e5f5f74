"""A fuzzer for oomlens' inputs: mutated real files of every input kind, hostile file trees and
triage archives, each run through the command line with a time and a memory limit.

* ``seeds`` lists the real files mutations start from (the crash corpus, the field logs, the
  test assets: never a hand-typed file);
* ``mutate`` changes bytes, lines, JSON values and pickled structures, and plants hostile text
  (script tags, spreadsheet formulas, terminal escapes, bidi overrides);
* ``shapes``, ``documents`` and ``hostile`` make issue 33's shapes: a real log as it reaches
  users (line ends, colours, launchers' prefixes, pastes, holes, container log formats,
  compression, UTF-16), documents that quote a real OOM, and hostile pickles, snapshots,
  captures, names and configs;
* ``cases`` builds one runnable case per kind from a seed: its files, its special files
  (FIFOs, symbolic links, sockets) and its command line;
* ``runner`` runs a case in a forked child of a warm process, with a wall-clock limit and its
  memory growth measured (and capped), and collects exit code, stdout, stderr and outputs;
* ``oracles`` says what is a finding: an internal error (exit 1, a traceback, an input that
  cost an "internal error"), a hang, a memory blow-up, an injection (markup, a formula, an
  escape sequence or a control character reaching an output), code execution, an output that
  is not UTF-8, and a wrong-direction verdict (``direction``: compared with the verdict the
  untransformed seed gets, a failure read as no failure, a document read as an OOM).

``test_fuzz.py`` runs a short seeded campaign in the test suite; a long one runs on demand::

    python -m tests.fuzz --count 5000 --seed 12 --jobs 2 --findings /tmp/fuzz-findings
"""
