"""What doit remembers and how it decides "up to date": the state DB backend (statedb),
content-decided inputs (checker) and outputs (outputs), the stamps memo both use (stamps), and what
failed since (failures)."""
