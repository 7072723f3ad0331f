"""Small helpers shared by both processes: atomic io, rank/world, step ranges, argument checks."""
