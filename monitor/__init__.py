"""Sources -> normalized events: format parsers, file tailers, the app-server tap."""
