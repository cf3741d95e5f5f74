"""What library code does, as reviewed data generated from the libraries' own source.

``library_frames.json`` maps a library file (as installed: ``deepspeed/runtime/engine.py``) and
a function name to a role (``optimizer_step``, ``checkpoint_save``, ``config_check``...); it is
written by ``scripts/gen_library_knowledge.py`` from the libraries' public repositories and
released packages, at the versions it records.  ``frames`` reads it.
"""
