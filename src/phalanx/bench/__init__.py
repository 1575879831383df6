"""`phalanx bench`: side-by-side step timing, profile, scaling."""
