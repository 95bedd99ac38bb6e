"""Evaluation for publication: per-participant breakdowns, participant bootstrap CIs, paper-style
tables from sweeps (seeds / folds -> mean +- std), rater agreement and plots."""
