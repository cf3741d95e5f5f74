"""The rules: one module per diagnosis id, each declaring itself once (``base.RuleSpec``) and
found by the engine (``engine.RULES``); ``_common`` holds what several rules ask the same way,
``thresholds`` the numbers they compare facts with."""
