"""Draft heads: the DCOCO corrector (grid, loss, selection, pair counts) and the sequential
heads."""
