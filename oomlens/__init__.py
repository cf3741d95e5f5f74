"""oomlens: what killed a GPU training job, on which rank, with the evidence, and the knob
to change.

Data flows one way: ``ingest`` turns files into typed, immutable facts (``oomlens.facts``),
``analysis`` derives further facts from them, ``rules`` turn facts into diagnoses, and
``render`` turns diagnoses and facts into text, JSON, Markdown or HTML.
"""

__version__ = "0.1.0"
