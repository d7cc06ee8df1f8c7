"""Live ranks: DDP ranks that stay up between cells, and the kernel that drives them."""
