"""Tests of the controller's pure parts: errors, Maglev rings, configuration."""
