"""How ranks exchange values: process groups or threads (loopback), the wire format of
messages, and sending beside compute."""
