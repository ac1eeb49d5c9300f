//! kfuse facade
