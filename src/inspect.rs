//! Placeholder for `ferroce inspect`.
