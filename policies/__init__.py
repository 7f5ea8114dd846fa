"""Request classification: rules file, matcher and capability guard. Pure: no I/O."""
