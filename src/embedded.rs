//! Running without external infrastructure: the private PostgreSQL cluster used when no
//! database URL is given (server, tests), and the all-in-one `steward deploy`.

pub mod deploy;
pub mod postgres;
