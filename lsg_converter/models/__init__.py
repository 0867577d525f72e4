"""Remote code of LSG models: flat files, relative imports only, no import of lsg_converter."""
