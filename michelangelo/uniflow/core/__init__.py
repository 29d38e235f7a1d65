"""uniflow core."""
