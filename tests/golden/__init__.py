"""Golden reports of the crash corpus: what oomlens prints for every case, in every format.

``python -m tests.golden --update`` writes them (``tests/golden/analyze/<case>/<inputs>.<ext>``
and ``tests/golden/check/<case>.<ext>``); ``test_golden.py`` renders them again and compares.
A change of a report is then a deliberate, reviewable diff of these files.
"""
