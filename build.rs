// The migrations are embedded by `sqlx::migrate!`, which cannot see a new file being added:
// rebuild when the folder changes.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
