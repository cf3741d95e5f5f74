"""The rules and the judgment around them: one module per diagnosis id, each declaring itself
once (``base.RuleSpec``) and found by the engine (``engine.RULES``); ``common`` holds what
several rules know and must say the same way, ``thresholds`` the numbers they compare facts
with, ``verdict`` the declared verdict table, ``uncertainty`` what is said when no cause is sure
enough, ``budget_reading`` the memory model read against the run, and ``judgment`` the one
entry that runs them all."""
