"""The project's developer tools (not part of the ``michelangelo`` wheel: pyproject.toml's
package discovery includes ``michelangelo*`` only)."""
