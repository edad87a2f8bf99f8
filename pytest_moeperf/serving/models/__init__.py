"""Serving's lowest part: serve profiles as data and the models the project generates; imports no other part."""
