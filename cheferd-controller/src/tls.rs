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
pub fn trusting(flag: &'static str, ca: &Path) -> Result<ClientTlsConfig, TlsFileError> {
    let (ca, _) = read_certs(flag, ca)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .timeout(HANDSHAKE_TIMEOUT))
}

/// A TLS file refused: the flag that named it, the file, and why.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {}: {kind}", path.display())]
pub struct TlsFileError {
    /// `--tls-cert`, `--tls-key`, `--tls-ca` or `--tls-client-ca`.
    pub flag: &'static str,
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub kind: TlsFileErrorKind,
}

/// Why a TLS file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileErrorKind {
    /// It could not be read.
    #[error("cannot read it ({0})")]
    Unreadable(std::io::Error),
    /// A directory, a device, or larger than 1 MiB.
    #[error("not a regular file of at most 1 MiB")]
    NotSmallFile,
    /// PEM that does not parse (the parser's reason).
    #[error("not a PEM certificate file ({0})")]
    NotCertificates(String),
    /// No certificate in it.
    #[error("no PEM certificate in the file")]
    NoCertificate,
    /// No private key in it (the parser's reason).
    #[error("no PEM private key in the file ({0})")]
    NoKey(String),
    /// A certificate that names no node.
    #[error(transparent)]
    NoNodeName(#[from] NodeNameError),
    /// A certificate rustls refuses with its key (e.g. a key of another certificate).
    #[error("unusable with {key_flag} {} ({reason})", key.display())]
    Unusable {
        /// The flag that gave the key.
        key_flag: &'static str,
        /// The key file.
        key: PathBuf,
        /// Why (rustls's error chain).
        reason: String,
    },
}

/// A client identity: the certificate in `cert` and its key in `key` (given as
/// `cert_flag` and `key_flag`).
pub fn identity(
    cert_flag: &'static str,
    cert: &Path,
    key_flag: &'static str,
    key: &Path,
) -> Result<Identity, TlsFileError> {
    let (cert, _) = read_certs(cert_flag, cert)?;
    Ok(Identity::from_pem(cert, read_key(key_flag, key)?))
}

/// Reads a file of PEM certificates, naming `flag` and the path in any error.
fn read_certs(
    flag: &'static str,
    path: &Path,
) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), TlsFileError> {
    let bytes = read_small(flag, path)?;
    let bad = |kind| file_error(flag, path, kind);
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(TlsFileErrorKind::NotCertificates(e.to_string())))?;
    if certs.is_empty() {
        return Err(bad(TlsFileErrorKind::NoCertificate));
    }
    Ok((bytes, certs))
}

/// Reads a PEM private key, naming `flag` and the path in any error.
fn read_key(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let bytes = read_small(flag, path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| file_error(flag, path, TlsFileErrorKind::NoKey(e.to_string())))?;
    Ok(bytes)
}

/// The largest PEM file read (a certificate chain, a key or a CA).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Reads a regular file of at most [`MAX_PEM_BYTES`].
fn read_small(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let bad = |kind| file_error(flag, path, kind);
    let metadata = std::fs::metadata(path).map_err(|e| bad(TlsFileErrorKind::Unreadable(e)))?;
    if !metadata.is_file() || metadata.len() > MAX_PEM_BYTES {
        return Err(bad(TlsFileErrorKind::NotSmallFile));
    }
    std::fs::read(path).map_err(|e| bad(TlsFileErrorKind::Unreadable(e)))
}

fn file_error(flag: &'static str, path: &Path, kind: TlsFileErrorKind) -> TlsFileError {
    TlsFileError {
        flag,
        path: path.to_path_buf(),
        kind,
    }
}

impl ServerTls {
    /// How one global controller checks another's server certificate (a standby
    /// asking `Standing`): trusting `client_ca`, the site CA, with no client identity.
    pub fn peer_client(&self) -> Result<ClientTlsConfig, TlsFileError> {
        trusting("--tls-client-ca", &self.client_ca)
    }

    /// Loads and checks the files: the TLS configuration of the gRPC server, checking
    /// a client certificate against `client_ca`. The handshake accepts a client without
    /// one (a standby global controller asking `Standing`); `Attach` refuses it.
    pub fn load(&self) -> Result<ServerTlsConfig, TlsFileError> {
        self.load_as(["--tls-cert", "--tls-key", "--tls-client-ca"])
    }

    /// [`ServerTls::load`], naming the certificate, key and CA by `flags` in errors.
    pub fn load_as(&self, flags: [&'static str; 3]) -> Result<ServerTlsConfig, TlsFileError> {
        let [cert_flag, key_flag, ca_flag] = flags;
        let identity = identity(cert_flag, &self.cert, key_flag, &self.key)?;
        let (ca, _) = read_certs(ca_flag, &self.client_ca)?;
        let config = ServerTlsConfig::new()
            .identity(identity)
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(true)
            .timeout(HANDSHAKE_TIMEOUT);
        // Builds the rustls configuration now, so a key that does not match its
        // certificate is reported at start, not at the first handshake.
        tonic::transport::Server::builder()
            .tls_config(config.clone())
            .map_err(|e| unusable([cert_flag, key_flag], &self.cert, &self.key, &e))?;
        Ok(config)
    }
}

/// The error of a certificate rustls refuses with its key: both files named.
fn unusable(
    [cert_flag, key_flag]: [&'static str; 2],
    cert: &Path,
    key: &Path,
    error: &dyn std::error::Error,
) -> TlsFileError {
    let kind = TlsFileErrorKind::Unusable {
        key_flag,
        key: key.to_path_buf(),
        reason: error_chain(error),
    };
    file_error(cert_flag, cert, kind)
}

impl ClientTls {
    /// Loads and checks the files.
    pub fn load(&self) -> Result<ClientTlsConfig, TlsFileError> {
        self.load_as(["--tls-cert", "--tls-key", "--tls-ca"])
    }

    /// [`ClientTls::load`], naming the certificate, key and CA by `flags` in errors.
    pub fn load_as(&self, flags: [&'static str; 3]) -> Result<ClientTlsConfig, TlsFileError> {
        let [cert_flag, key_flag, ca_flag] = flags;
        let identity = identity(cert_flag, &self.cert, key_flag, &self.key)?;
        let (ca, _) = read_certs(ca_flag, &self.ca)?;
        // Builds a rustls configuration with the identity alone now, so a key that does
        // not match its certificate is reported at start naming both files, not as a
        // failure of the connection to the global controller.
        Endpoint::from_static("https://localhost")
            .tls_config(ClientTlsConfig::new().identity(identity.clone()))
            .map_err(|e| unusable([cert_flag, key_flag], &self.cert, &self.key, &e))?;
        let mut config = ClientTlsConfig::new()
            .identity(identity)
            .ca_certificate(Certificate::from_pem(ca))
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }

    /// The node names the certificate carries (see [`node_names`]).
    pub fn node_names(&self) -> Result<Vec<String>, TlsFileError> {
        let (_, certs) = read_certs("--tls-cert", &self.cert)?;
        node_names(&certs[0]).map_err(|e| file_error("--tls-cert", &self.cert, e.into()))
    }
}

/// Why `--global URL` cannot be reached as given (the URL, and what is wrong).
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Not a URL.
    #[error("--global '{url}': not a URL ({reason})")]
    NotUrl {
        /// The URL as given.
        url: String,
        /// The parser's reason.
        reason: String,
    },
    /// An empty URL in a comma-separated list (the whole list).
    #[error("--global '{0}': an empty URL in the list")]
    EmptyInList(String),
    /// TLS given but the URL is plaintext.
    #[error("--global '{0}': with TLS the URL must start with https://")]
    NeedsHttps(String),
    /// An `https://` URL without TLS files.
    #[error(
        "--global '{0}': https:// needs --tls-cert, --tls-key and --tls-ca (plaintext: an http:// URL)"
    )]
    NeedsTls(String),
    /// The TLS configuration does not apply.
    #[error("TLS configuration: {}", error_chain(.0))]
    Tls(#[source] tonic::transport::Error),
}

/// An endpoint for `url`: with `tls` (which must then be `https://`), or plaintext
/// (`http://`).
pub fn endpoint(url: &str, tls: Option<ClientTlsConfig>) -> Result<Endpoint, EndpointError> {
    let https = url.starts_with("https://");
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| EndpointError::NotUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?
        .connect_timeout(Duration::from_secs(10));
    match tls {
        Some(tls) if https => endpoint.tls_config(tls).map_err(EndpointError::Tls),
        Some(_) => Err(EndpointError::NeedsHttps(url.to_string())),
        None if https => Err(EndpointError::NeedsTls(url.to_string())),
        None => Ok(endpoint),
    }
}

/// The node names a certificate speaks for: its DNS subject alternative names, or,
/// without any, its subject's common name.
pub fn node_names(cert: &[u8]) -> Result<Vec<String>, NodeNameError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| NodeNameError::NotX509(e.to_string()))?;
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
        return Err(NodeNameError::NoName);
    }
    Ok(names)
}

/// Why a certificate speaks for no node.
#[derive(Debug, thiserror::Error)]
pub enum NodeNameError {
    /// Not a certificate (the parser's reason).
    #[error("not an X.509 certificate ({0})")]
    NotX509(String),
    /// Neither a DNS name nor a common name.
    #[error("the certificate names no node (no DNS name, no common name)")]
    NoName,
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
pub fn check_name(name: &str) -> Result<(), NameError> {
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
        Err(NameError(name.to_string()))
    }
}

/// A name [`check_name`] refused (kept whole; shown shortened).
#[derive(Debug, thiserror::Error)]
#[error("'{}' is not a host name (letters, digits, '-', '_' and '.'-separated labels)", padll_wire::control::short(.0))]
pub struct NameError(pub String);

/// Why `cheferd certs` made no certificate.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// A file that would be replaced.
    #[error("{} exists: not replaced (remove it first to make a new one)", .0.display())]
    Exists(PathBuf),
    /// The output directory is some other file.
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A file or directory could not be made, written or read.
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        /// `create`, `write` or `read`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A CA file refused before it was read: a FIFO, a device, larger than
    /// [`MAX_PEM_BYTES`] (the reason).
    #[error("cannot {action} {}: {error}", path.display())]
    Read {
        /// What it is read as.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        error: padll_wire::config::ReadError,
    },
    /// No name given.
    #[error("give at least one name")]
    NoName,
    /// A name that is no host name.
    #[error(transparent)]
    BadName(#[from] NameError),
    /// The CA's files are not a CA's (the file and the reason).
    #[error("{}: {why}", path.display())]
    NotCa {
        /// The CA file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Generating a key or signing failed (what, and the library's reason).
    #[error("cannot {what}: {error}")]
    Crypto {
        /// `make a key`, `sign the certificate`, …
        what: &'static str,
        /// The reason.
        error: rcgen::Error,
    },
}

fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CertsError + 'a {
    move |error| CertsError::Io {
        action,
        path: path.to_path_buf(),
        error,
    }
}

/// Reads a PEM file of the CA with care (`/dev/zero` or a FIFO in its place is refused,
/// not read until memory runs out or forever).
fn read_pem(action: &'static str, path: &Path) -> Result<String, CertsError> {
    padll_wire::config::read_text_file(path, MAX_PEM_BYTES).map_err(|error| CertsError::Read {
        action,
        path: path.to_path_buf(),
        error,
    })
}

fn crypto_error(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertsError {
    move |error| CertsError::Crypto { what, error }
}

/// Validity of certificates `cheferd certs` makes, from a day ago (clock skew).
fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(days as i64);
}

/// Writes a new file (never replacing one) with `mode`.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), CertsError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => CertsError::Exists(path.to_path_buf()),
            _ => io_error("create", path)(e),
        })?;
    file.write_all(text.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(io_error("write", path))
}

/// Creates `dir` (mode 0700 if new) and checks that none of `files` exists in it yet,
/// so that nothing is written unless everything can be.
fn prepare(dir: &Path, files: &[&str]) -> Result<(), CertsError> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_error("create", dir))?;
    } else if !dir.is_dir() {
        return Err(CertsError::NotADirectory(dir.to_path_buf()));
    }
    for file in files {
        let path = dir.join(file);
        if path.exists() || path.symlink_metadata().is_ok() {
            return Err(CertsError::Exists(path));
        }
    }
    Ok(())
}

/// `cheferd certs ca`: a new site CA in `out` (`ca.pem`, `ca.key` mode 0600).
pub fn make_ca(out: &Path, name: &str, days: u32) -> Result<Vec<PathBuf>, CertsError> {
    prepare(out, &[CA_CERT, CA_KEY])?;
    let key = KeyPair::generate().map_err(crypto_error("make a key"))?;
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
        .map_err(crypto_error("sign the CA certificate"))?;
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
) -> Result<Vec<PathBuf>, CertsError> {
    let Some(first) = names.first() else {
        return Err(CertsError::NoName);
    };
    for name in names {
        if name.parse::<std::net::IpAddr>().is_ok() && role == Role::Server {
            continue;
        }
        check_name(name)?;
    }
    let (ca_cert_path, ca_key_path) = (ca_dir.join(CA_CERT), ca_dir.join(CA_KEY));
    let ca_cert = read_pem("read the CA certificate", &ca_cert_path)?;
    let ca_key_text = read_pem("read the CA key", &ca_key_path)?;
    let not_ca = |path: &Path, why: String| CertsError::NotCa {
        path: path.to_path_buf(),
        why,
    };
    let ca_key = KeyPair::from_pem(&ca_key_text)
        .map_err(|e| not_ca(&ca_key_path, format!("not a PEM key ({e})")))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, ca_key)
        .map_err(|e| not_ca(&ca_cert_path, format!("not a CA certificate ({e})")))?;
    let (cert_file, key_file) = match role {
        Role::Node => (node_cert_file(first), node_key_file(first)),
        Role::Server => (SERVER_CERT.to_string(), SERVER_KEY.to_string()),
    };
    prepare(out, &[&cert_file, &key_file])?;
    let key = KeyPair::generate().map_err(crypto_error("make a key"))?;
    let mut params =
        CertificateParams::new(names.to_vec()).map_err(crypto_error("use these names"))?;
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
        .map_err(crypto_error("sign the certificate"))?;
    let (cert_path, key_path) = (out.join(cert_file), out.join(key_file));
    write_new(&key_path, &key.serialize_pem(), 0o600)?;
    write_new(&cert_path, &cert.pem(), 0o644)?;
    Ok(vec![cert_path, key_path])
}

/// A throwaway CA with a server certificate for loopback (`127.0.0.1`, `localhost`)
/// and node certificates for `nodes`, in `dir` (the demo and tests use it).
pub fn make_loopback_site(dir: &Path, nodes: &[&str]) -> Result<(), CertsError> {
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
        let node_cert = dir.path().join("node-node-a.pem");
        assert!(matches!(again, Err(CertsError::Exists(path)) if path == node_cert));
        let ca = make_ca(dir.path(), "x", 1).unwrap_err();
        assert!(ca.to_string().contains("exists"), "{ca}");
    }

    #[test]
    fn a_key_of_another_certificate_is_named_with_it() {
        let dir = tempfile::tempdir().unwrap();
        make_loopback_site(dir.path(), &["n1", "n2"]).unwrap();
        let mut node = loopback_node(dir.path(), "n1");
        node.key = dir.path().join("node-n2.key");
        let error = node.load().unwrap_err();
        assert!(
            matches!(error.kind, TlsFileErrorKind::Unusable { ref key, .. } if *key == node.key)
                && error.path == node.cert,
            "{error:?}"
        );
        let mut server = loopback_server(dir.path());
        server.key = node.key.clone();
        let error = server.load().unwrap_err();
        assert!(
            matches!(error.kind, TlsFileErrorKind::Unusable { ref key, .. } if *key == node.key),
            "{error:?}"
        );
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
            matches!(error.kind, TlsFileErrorKind::Unreadable(_)) && error.flag == "--tls-cert",
            "{error:?}"
        );
        let error = error.to_string();
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
        let error = junk.load().unwrap_err().to_string();
        assert!(
            error.contains("junk.pem") && error.contains("no PEM"),
            "{error}"
        );
        // A CA whose files are a device or a FIFO is refused, not read without end.
        make_loopback_site(dir.path(), &["n0"]).unwrap();
        let odd = dir.path().join("odd-ca");
        std::fs::create_dir(&odd).unwrap();
        std::os::unix::fs::symlink("/dev/zero", odd.join(CA_CERT)).unwrap();
        let fifo = std::ffi::CString::new(odd.join(CA_KEY).to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let out = dir.path().join("out");
        let error = make_leaf(Role::Node, &["n1".into()], &odd, &out, 1).unwrap_err();
        let error = error.to_string();
        assert!(
            error.contains(CA_CERT) && error.contains("not a regular file"),
            "{error}"
        );
        std::fs::remove_file(odd.join(CA_CERT)).unwrap();
        std::fs::copy(dir.path().join(CA_CERT), odd.join(CA_CERT)).unwrap();
        let error = make_leaf(Role::Node, &["n1".into()], &odd, &out, 1).unwrap_err();
        let error = error.to_string();
        assert!(
            error.contains(CA_KEY) && error.contains("not a regular file"),
            "{error}"
        );
        assert!(check_name("node 1").is_err());
        assert!(check_name("a..b").is_err());
        assert!(check_name("cn-0042.cluster").is_ok());
    }
}
