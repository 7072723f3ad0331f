"""Examining one step eagerly: capture a step's inputs and Parameters, replay it op by op."""
