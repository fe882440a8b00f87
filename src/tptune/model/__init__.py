"""The model: its shapes, the four linear ops, memory, and the plan of cases it implies."""
