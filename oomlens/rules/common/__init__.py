"""What several rules know and must say the same way, one module per subject: citing
evidence (``evidence``), what to capture (``advice``), an OOM message's numbers (``message``),
when in the run (``timeline``), model states (``model_states``), host memory (``host``).
Rules import them; nothing here decides a diagnosis."""
