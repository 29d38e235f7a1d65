"""Michelangelo SDK."""
