"""exporters package of torchlean-bridge."""
