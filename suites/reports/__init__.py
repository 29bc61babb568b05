"""Tests of the results schema and the HTML report."""
