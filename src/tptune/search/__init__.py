"""The searches: bisection along a dimension, the knob search, the TP decision, step planning."""
