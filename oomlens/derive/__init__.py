"""The derive stage: a run's facts, derived once, before any rule reads them.

``run.Digest`` digests each input's facts as it is read; ``run.derive_run`` derives what every
rule, the verdict and the renderers ask about the whole run (the per-rank picture, the world
size, the config the run used, the ZeRO memory model...) and the signals of
``oomlens.facts.signals`` (``run.derive_signals``: signal deaths and silent ends, host memory
pressure, config rejections, look-alike failures, pinned host failures, the place of every OOM,
cut tracebacks), each from the module that knows how (``signals``, ``rejections``,
``lookalikes``, ``pinned``, ``failure_site``).  Nothing above this stage derives a signal again:
the rules, the report and the renderers may not import it (an import-linter contract).
"""
