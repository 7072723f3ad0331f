"""Self-contained training scripts that fail on purpose; ``mindguard demo`` hunts them down."""
