"""`bench run`: a comparison of objectives, (objective, seed) pairs trained under identical conditions."""
