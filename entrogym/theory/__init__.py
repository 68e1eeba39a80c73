"""Numerical checks of the paper's theory (Thm 1-3, Cor 1) and the tabular policy the bandit lab
(``entrogym.experiments.lab``) trains."""
