"""Examples shipped inside the package, so they run from an installed wheel in any folder."""
