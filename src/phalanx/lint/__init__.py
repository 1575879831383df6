"""`phalanx lint`: static analysis of training scripts for DDP pitfalls (ast only)."""
