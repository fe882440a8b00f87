"""The side-by-side statistics: rounds, paired ratios, noise, session noise, picks."""
