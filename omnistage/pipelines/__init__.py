"""Model families: one module each, registering its pipeline topology and input processors."""
