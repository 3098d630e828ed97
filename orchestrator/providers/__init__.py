"""Rented instances through their provider's API: state, power on/off, the live SSH endpoint, price."""
