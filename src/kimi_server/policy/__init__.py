"""Per-model contract rules, declared as data (the model catalogue)."""
