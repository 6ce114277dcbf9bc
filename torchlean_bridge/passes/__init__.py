"""IR-to-IR passes: one transformation per module, one signature (docs/architecture.md)."""
