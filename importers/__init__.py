"""importers package of torchlean-bridge."""
