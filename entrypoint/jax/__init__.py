"""JAX with Keras 3: the framework package (docs/jax.md)."""
