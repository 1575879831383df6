"""The built-in MiniGPT trainer (on the public Run API)."""
