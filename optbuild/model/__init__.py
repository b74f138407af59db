"""Feeding and judging models: input declarations, sample inputs, and how far a candidate's
outputs are from a reference's."""
