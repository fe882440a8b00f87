"""From measured points to answers: winners, TP decision, layer stage."""
