"""Hardware specs: devices and links, and a small catalog of real GPUs with public sources."""
