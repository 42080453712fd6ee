//! The HTTP ceiling for benchmarks: an axum server that answers every request
//! with a small JSON body without reading the request. Usage: `bare ADDR`.

use axum::Router;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8081".to_string());
    let app = Router::new().fallback(|| async { r#"{"allowed":true}"# });
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("bare listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await
}
