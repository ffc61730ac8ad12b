"""The relay's wire protocol, sans-I/O: frames, codec, auth tokens, URLs and close codes, the
capability descriptor, the announcements of our additions, and the errors that say who is to
blame.  The only place the wire format is written and read; nothing here touches a socket."""
