"""AWS access: one client factory, the pool queue, S3 storage, and Layer 0 acquisition."""
