"""`phalanx doctor`: checks in a live process group."""
