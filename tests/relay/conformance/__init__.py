"""Conformance doubles and tests for the original relay contract."""
