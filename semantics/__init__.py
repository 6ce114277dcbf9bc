"""semantics package of torchlean-bridge."""
