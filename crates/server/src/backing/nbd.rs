//! A backing device served over NBD (filled in by the NBD client work).
