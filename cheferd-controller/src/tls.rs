//! Mutual TLS between local and global controllers, and the site CA that makes it
//! possible (`cheferd certs`).
//!
//! Every local controller holds a **node certificate** (extended key usage
//! `clientAuth` only) whose DNS subject alternative name is its node name; the global
//! controller holds a **server certificate** (`serverAuth` only) naming the host names
//! and addresses local controllers reach it by. Both are signed by one site CA, which
//! each side trusts alone (no system roots). The global controller requires a client
//! certificate in the handshake and takes the node's identity from it: a `Register`
//! naming another node is refused (`PERMISSION_DENIED`), so a certificate speaks for
//! its own node only. A node certificate cannot serve as the global controller's and a
//! server certificate cannot register as a node (their key usages differ).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// The CA's certificate and key in a CA directory.
pub const CA_CERT: &str = "ca.pem";
/// See [`CA_CERT`].
pub const CA_KEY: &str = "ca.key";
/// The global controller's certificate and key in an output directory.
pub const SERVER_CERT: &str = "server.pem";
/// See [`SERVER_CERT`].
pub const SERVER_KEY: &str = "server.key";

/// A node's certificate file name (`node-NAME.pem`) in an output directory.
pub fn node_cert_file(name: &str) -> String {
    format!("node-{name}.pem")
}

/// A node's key file name (`node-NAME.key`).
pub fn node_key_file(name: &str) -> String {
    format!("node-{name}.key")
}

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The global controller's TLS files (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// Its certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA whose node certificates are accepted (PEM).
    pub client_ca: PathBuf,
}

/// A local controller's TLS files (`--tls-cert`, `--tls-key`, `--tls-ca`).
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// Its node certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA the global controller's certificate must chain to (PEM).
    pub ca: PathBuf,
    /// The name the global controller's certificate must carry (default: the URL's host).
    pub server_name: Option<String>,
}

/// A client configuration that trusts the CA in `ca` (given as `flag`), with no client
/// identity.
pub fn trusting(flag: &str, ca: &Path) -> Result<ClientTlsConfig, String> {
    let (ca, _) = read_certs(flag, ca)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .timeout(HANDSHAKE_TIMEOUT))
}

/// Reads a file of PEM certificates, naming `flag` and the path in any error.
fn read_certs(flag: &str, path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), String> {
    let bytes = read_small(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            format!(
                "{flag} {}: not a PEM certificate file ({e})",
                path.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{flag} {}: no PEM certificate in the file",
            path.display()
        ));
    }
    Ok((bytes, certs))
}

/// Reads a PEM private key, naming `flag` and the path in any error.
fn read_key(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let bytes = read_small(flag, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        format!(
            "{flag} {}: no PEM private key in the file ({e})",
            path.display()
        )
    })?;
    Ok(bytes)
}

/// Reads a regular file of at most 1 MiB.
fn read_small(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let metadata = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {flag} {}: {e}", path.display()))?;
    if !metadata.is_file() || metadata.len() > 1 << 20 {
        return Err(format!(
            "{flag} {}: not a regular file of at most 1 MiB",
            path.display()
        ));
    }
    std::fs::read(path).map_err(|e| format!("cannot read {flag} {}: {e}", path.display()))
}

impl ServerTls {
    /// How one global controller checks another's server certificate (a standby
    /// asking `Standing`): trusting `client_ca`, the site CA, with no client identity.
    pub fn peer_client(&self) -> Result<ClientTlsConfig, String> {
        trusting("--tls-client-ca", &self.client_ca)
    }

    /// Loads and checks the files: the TLS configuration of the gRPC server, checking
    /// a client certificate against `client_ca`. The handshake accepts a client without
    /// one (a standby global controller asking `Standing`); `Attach` refuses it.
    pub fn load(&self) -> Result<ServerTlsConfig, String> {
        let (cert, _) = read_certs("--tls-cert", &self.cert)?;
        let key = read_key("--tls-key", &self.key)?;
        let (ca, _) = read_certs("--tls-client-ca", &self.client_ca)?;
        let config = ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(true)
            .timeout(HANDSHAKE_TIMEOUT);
        // Builds the rustls configuration now, so a key that does not match its
        // certificate is reported at start, not at the first handshake.
        tonic::transport::Server::builder()
            .tls_config(config.clone())
            .map_err(|e| {
                format!(
                    "--tls-cert {} / --tls-key {}: unusable ({})",
                    self.cert.display(),
                    self.key.display(),
                    error_chain(&e)
                )
            })?;
        Ok(config)
    }
}

impl ClientTls {
    /// Loads and checks the files.
    pub fn load(&self) -> Result<ClientTlsConfig, String> {
        let (cert, _) = read_certs("--tls-cert", &self.cert)?;
        let key = read_key("--tls-key", &self.key)?;
        let (ca, _) = read_certs("--tls-ca", &self.ca)?;
        let mut config = ClientTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .ca_certificate(Certificate::from_pem(ca))
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }

    /// The node names the certificate carries (see [`node_names`]).
    pub fn node_names(&self) -> Result<Vec<String>, String> {
        let (_, certs) = read_certs("--tls-cert", &self.cert)?;
        node_names(&certs[0]).map_err(|e| format!("--tls-cert {}: {e}", self.cert.display()))
    }
}

/// An endpoint for `url`: with `tls` (which must then be `https://`), or plaintext
/// (`http://`).
pub fn endpoint(url: &str, tls: Option<ClientTlsConfig>) -> Result<Endpoint, String> {
    let https = url.starts_with("https://");
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| format!("--global '{url}': not a URL ({e})"))?
        .connect_timeout(Duration::from_secs(10));
    match tls {
        Some(tls) if https => endpoint
            .tls_config(tls)
            .map_err(|e| format!("TLS configuration: {}", error_chain(&e))),
        Some(_) => Err(format!(
            "--global '{url}': with TLS the URL must start with https://"
        )),
        None if https => Err(format!(
            "--global '{url}': https:// needs --tls-cert, --tls-key and --tls-ca (plaintext: an http:// URL)"
        )),
        None => Ok(endpoint),
    }
}

/// The node names a certificate speaks for: its DNS subject alternative names, or,
/// without any, its subject's common name.
pub fn node_names(cert: &[u8]) -> Result<Vec<String>, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| format!("not an X.509 certificate ({e})"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.push(dns.to_string());
            }
        }
    }
    if names.is_empty() {
        if let Some(cn) = parsed
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
        {
            names.push(cn.to_string());
        }
    }
    if names.is_empty() {
        return Err("the certificate names no node (no DNS name, no common name)".into());
    }
    Ok(names)
}

/// An error with its sources, on one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Whether `name` can be a node or host name in a certificate: DNS-name characters
/// (`A-Z a-z 0-9 - . _`), 1–253 bytes, no empty label.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        && name
            .split('.')
            .all(|label| !label.is_empty() && label.len() <= 63);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{}' is not a host name (letters, digits, '-', '_' and '.'-separated labels)",
            padll_wire::control::short(name)
        ))
    }
}

/// Validity of certificates `cheferd certs` makes, from a day ago (clock skew).
fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(days as i64);
}

/// Writes a new file (never replacing one) with `mode`.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => format!(
                "{} exists: not replaced (remove it first to make a new one)",
                path.display()
            ),
            _ => format!("cannot create {}: {e}", path.display()),
        })?;
    file.write_all(text.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Creates `dir` (mode 0700 if new) and checks that none of `files` exists in it yet,
/// so that nothing is written unless everything can be.
fn prepare(dir: &Path, files: &[&str]) -> Result<(), String> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    } else if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    for file in files {
        let path = dir.join(file);
        if path.exists() || path.symlink_metadata().is_ok() {
            return Err(format!(
                "{} exists: not replaced (remove it first to make a new one)",
                path.display()
            ));
        }
    }
    Ok(())
}

/// `cheferd certs ca`: a new site CA in `out` (`ca.pem`, `ca.key` mode 0600).
pub fn make_ca(out: &Path, name: &str, days: u32) -> Result<Vec<PathBuf>, String> {
    prepare(out, &[CA_CERT, CA_KEY])?;
    let key = KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, days);
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("cannot sign the CA certificate: {e}"))?;
    let (cert_path, key_path) = (out.join(CA_CERT), out.join(CA_KEY));
    write_new(&key_path, &key.serialize_pem(), 0o600)?;
    write_new(&cert_path, &cert.pem(), 0o644)?;
    Ok(vec![cert_path, key_path])
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A local controller: `clientAuth`, DNS name = the node name.
    Node,
    /// The global controller: `serverAuth`, the names and addresses it is reached by.
    Server,
}

/// `cheferd certs node` / `cheferd certs server`: a key and a certificate signed by the
/// CA in `ca_dir`, written to `out` (the key mode 0600). `names[0]` is the node name
/// (node) or the first of the host names and IP addresses (server).
pub fn make_leaf(
    role: Role,
    names: &[String],
    ca_dir: &Path,
    out: &Path,
    days: u32,
) -> Result<Vec<PathBuf>, String> {
    let Some(first) = names.first() else {
        return Err("give at least one name".into());
    };
    for name in names {
        if name.parse::<std::net::IpAddr>().is_ok() && role == Role::Server {
            continue;
        }
        check_name(name)?;
    }
    let ca_cert = std::fs::read_to_string(ca_dir.join(CA_CERT)).map_err(|e| {
        format!(
            "cannot read the CA certificate {}: {e}",
            ca_dir.join(CA_CERT).display()
        )
    })?;
    let ca_key_text = std::fs::read_to_string(ca_dir.join(CA_KEY)).map_err(|e| {
        format!(
            "cannot read the CA key {}: {e}",
            ca_dir.join(CA_KEY).display()
        )
    })?;
    let ca_key = KeyPair::from_pem(&ca_key_text)
        .map_err(|e| format!("{}: not a PEM key ({e})", ca_dir.join(CA_KEY).display()))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, ca_key).map_err(|e| {
        format!(
            "{}: not a CA certificate ({e})",
            ca_dir.join(CA_CERT).display()
        )
    })?;
    let (cert_file, key_file) = match role {
        Role::Node => (node_cert_file(first), node_key_file(first)),
        Role::Server => (SERVER_CERT.to_string(), SERVER_KEY.to_string()),
    };
    prepare(out, &[&cert_file, &key_file])?;
    let key = KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
    let mut params = CertificateParams::new(names.to_vec())
        .map_err(|e| format!("bad name in {names:?}: {e}"))?;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, first.as_str());
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![match role {
        Role::Node => ExtendedKeyUsagePurpose::ClientAuth,
        Role::Server => ExtendedKeyUsagePurpose::ServerAuth,
    }];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, days);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| format!("cannot sign the certificate: {e}"))?;
    let (cert_path, key_path) = (out.join(cert_file), out.join(key_file));
    write_new(&key_path, &key.serialize_pem(), 0o600)?;
    write_new(&cert_path, &cert.pem(), 0o644)?;
    Ok(vec![cert_path, key_path])
}

/// A throwaway CA with a server certificate for loopback (`127.0.0.1`, `localhost`)
/// and node certificates for `nodes`, in `dir` (the demo and tests use it).
pub fn make_loopback_site(dir: &Path, nodes: &[&str]) -> Result<(), String> {
    make_ca(dir, "cheferd throwaway CA", 30)?;
    make_leaf(
        Role::Server,
        &["127.0.0.1".to_string(), "localhost".to_string()],
        dir,
        dir,
        30,
    )?;
    for node in nodes {
        make_leaf(Role::Node, &[node.to_string()], dir, dir, 30)?;
    }
    Ok(())
}

/// The server side of a loopback site made by [`make_loopback_site`].
pub fn loopback_server(dir: &Path) -> ServerTls {
    ServerTls {
        cert: dir.join(SERVER_CERT),
        key: dir.join(SERVER_KEY),
        client_ca: dir.join(CA_CERT),
    }
}

/// A node's side of a loopback site made by [`make_loopback_site`].
pub fn loopback_node(dir: &Path, node: &str) -> ClientTls {
    ClientTls {
        cert: dir.join(node_cert_file(node)),
        key: dir.join(node_key_file(node)),
        ca: dir.join(CA_CERT),
        server_name: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn certificates_carry_the_node_name_and_keys_are_private() {
        let dir = tempfile::tempdir().unwrap();
        make_loopback_site(dir.path(), &["node-a"]).unwrap();
        for key in [CA_KEY, SERVER_KEY, "node-node-a.key"] {
            let mode = std::fs::metadata(dir.path().join(key))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }
        let node = loopback_node(dir.path(), "node-a");
        assert_eq!(node.node_names().unwrap(), vec!["node-a".to_string()]);
        node.load().unwrap();
        loopback_server(dir.path()).load().unwrap();
        // Nothing is replaced.
        let again = make_leaf(Role::Node, &["node-a".into()], dir.path(), dir.path(), 1);
        assert!(again.unwrap_err().contains("exists"));
        assert!(make_ca(dir.path(), "x", 1).unwrap_err().contains("exists"));
    }

    #[test]
    fn bad_files_and_names_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = ServerTls {
            cert: dir.path().join("nope.pem"),
            key: dir.path().join("nope.key"),
            client_ca: dir.path().join("ca.pem"),
        };
        let error = missing.load().unwrap_err();
        assert!(
            error.contains("--tls-cert") && error.contains("nope.pem"),
            "{error}"
        );
        std::fs::write(dir.path().join("junk.pem"), "hello").unwrap();
        let junk = ClientTls {
            cert: dir.path().join("junk.pem"),
            key: dir.path().join("junk.pem"),
            ca: dir.path().join("junk.pem"),
            server_name: None,
        };
        let error = junk.load().unwrap_err();
        assert!(
            error.contains("junk.pem") && error.contains("no PEM"),
            "{error}"
        );
        assert!(check_name("node 1").is_err());
        assert!(check_name("a..b").is_err());
        assert!(check_name("cn-0042.cluster").is_ok());
    }
}
