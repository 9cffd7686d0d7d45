"""The neutral message model every transport renders, and the views built from run state."""
