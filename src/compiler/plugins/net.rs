//! IP address plugins and `std::validate_type`, the validator behind std's typedefs
//! (`std::ipv4_address`, `std::uuid`, `std::email_str`, …), implemented natively.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Args, Default, PluginDef, fail, opt, req};
use crate::compiler::value::Value;

fn s(a: &Args, i: usize) -> &str {
    a.values[i].as_str().unwrap_or("")
}

/// An address with a prefix length: `10.0.0.1/24`.
#[derive(Clone, Copy, Debug)]
pub struct Iface {
    pub addr: IpAddr,
    pub prefix: u32,
}

impl Iface {
    fn bits(&self) -> u32 {
        if self.addr.is_ipv4() { 32 } else { 128 }
    }

    fn as_u128(&self) -> u128 {
        ip_u128(self.addr)
    }

    fn mask(&self) -> u128 {
        let bits = self.bits();
        if self.prefix == 0 {
            0
        } else {
            let all: u128 = if bits == 32 { 0xffff_ffff } else { u128::MAX };
            (all << (bits - self.prefix)) & all
        }
    }

    fn network(&self) -> u128 {
        self.as_u128() & self.mask()
    }
}

fn ip_u128(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u32::from(v) as u128,
        IpAddr::V6(v) => u128::from(v),
    }
}

fn u128_ip(v: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

pub fn parse_addr(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>().ok()
}

fn parse_prefix(p: &str, v4: bool) -> Option<u32> {
    let max = if v4 { 32 } else { 128 };
    if !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) {
        let n: u32 = p.parse().ok()?;
        return if n <= max { Some(n) } else { None };
    }
    if v4 {
        // a netmask such as 255.255.255.0
        let m: Ipv4Addr = p.parse().ok()?;
        let bits = u32::from(m);
        let ones = bits.leading_ones();
        if bits.checked_shl(ones).unwrap_or(0) == 0 {
            return Some(ones);
        }
    }
    None
}

pub fn parse_iface(s: &str) -> Option<Iface> {
    let (a, p) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let addr = parse_addr(a)?;
    let prefix = match p {
        Some(p) => parse_prefix(p, addr.is_ipv4())?,
        None => {
            if addr.is_ipv4() {
                32
            } else {
                128
            }
        }
    };
    Some(Iface { addr, prefix })
}

/// A network: host bits must be zero (Python's strict `ip_network`).
pub fn parse_network(s: &str) -> Option<Iface> {
    let i = parse_iface(s)?;
    if i.network() != i.as_u128() {
        return None;
    }
    Some(i)
}

fn valid_uuid(s: &str) -> bool {
    let t = s
        .trim_start_matches("urn:uuid:")
        .trim_matches(|c| c == '{' || c == '}');
    let hex: String = t.chars().filter(|c| *c != '-').collect();
    hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit())
}

fn valid_email(s: &str) -> bool {
    let Some((local, domain)) = s.rsplit_once('@') else {
        return false;
    };
    !local.is_empty()
        && !local.contains(char::is_whitespace)
        && domain.contains('.')
        && domain.split('.').all(|l| {
            !l.is_empty()
                && l.chars().all(|c| c.is_alphanumeric() || c == '-')
                && !l.starts_with('-')
        })
}

fn valid_url(s: &str, http_only: bool) -> bool {
    let Some((scheme, rest)) = s.split_once("://") else {
        return false;
    };
    if scheme.is_empty()
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return false;
    }
    if http_only && !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
        return false;
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit_once('@').map(|(_, h)| h).unwrap_or(host);
    !host.is_empty() && !host.contains(char::is_whitespace)
}

fn digits(s: &str, n: usize) -> bool {
    s.len() == n && s.chars().all(|c| c.is_ascii_digit())
}

fn valid_date(s: &str) -> bool {
    let p: Vec<&str> = s.split('-').collect();
    if p.len() != 3 || !digits(p[0], 4) || !digits(p[1], 2) || !digits(p[2], 2) {
        return false;
    }
    let (y, m, d): (i32, u32, u32) = (
        p[0].parse().unwrap_or(0),
        p[1].parse().unwrap_or(0),
        p[2].parse().unwrap_or(0),
    );
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    (1..=12).contains(&m) && d >= 1 && d <= days[(m - 1) as usize]
}

fn valid_time(s: &str) -> bool {
    let s = s.trim_end_matches('Z');
    let s = match s.find(['+', '-']) {
        Some(i) => {
            let tz = &s[i + 1..];
            if !(digits(tz, 4)
                || (tz.len() == 5
                    && digits(&tz[..2], 2)
                    && &tz[2..3] == ":"
                    && digits(&tz[3..], 2)))
            {
                return false;
            }
            &s[..i]
        }
        None => s,
    };
    let (hms, frac) = match s.split_once('.') {
        Some((h, f)) => (h, Some(f)),
        None => (s, None),
    };
    if let Some(f) = frac
        && (f.is_empty() || f.len() > 6 || !f.chars().all(|c| c.is_ascii_digit()))
    {
        return false;
    }
    let p: Vec<&str> = hms.split(':').collect();
    if p.len() < 2 || p.len() > 3 || !p.iter().all(|x| digits(x, 2)) {
        return false;
    }
    let h: u32 = p[0].parse().unwrap_or(99);
    let m: u32 = p[1].parse().unwrap_or(99);
    let sec: u32 = p.get(2).map(|x| x.parse().unwrap_or(99)).unwrap_or(0);
    h < 24 && m < 60 && sec < 60
}

fn valid_datetime(s: &str) -> bool {
    match s.split_once(['T', ' ']) {
        Some((d, t)) => valid_date(d) && valid_time(t),
        None => valid_date(s),
    }
}

fn num_param(params: &Value, name: &str) -> Option<f64> {
    match params {
        Value::Dict(d) => d.get(name).and_then(Value::as_f64),
        _ => None,
    }
}

/// `std::validate_type(fq_type_name, value, params)`.
pub fn validate_type(ty: &str, v: &Value, params: &Value) -> bool {
    let text = v.as_str();
    let num_ok = |x: f64| {
        let gt = num_param(params, "gt").is_none_or(|b| x > b);
        let ge = num_param(params, "ge").is_none_or(|b| x >= b);
        let lt = num_param(params, "lt").is_none_or(|b| x < b);
        let le = num_param(params, "le").is_none_or(|b| x <= b);
        let mo =
            num_param(params, "multiple_of").is_none_or(|m| m != 0.0 && (x / m).fract() == 0.0);
        gt && ge && lt && le && mo
    };
    match ty {
        "datetime.date" => text.is_some_and(valid_date),
        "datetime.time" => text.is_some_and(valid_time),
        "datetime.datetime" => text.is_some_and(valid_datetime),
        "ipaddress.IPv4Address" => text.is_some_and(|t| t.parse::<Ipv4Addr>().is_ok()),
        "ipaddress.IPv6Address" => text.is_some_and(|t| t.parse::<Ipv6Addr>().is_ok()),
        "ipaddress.IPv4Interface" => text.and_then(parse_iface).is_some_and(|i| i.addr.is_ipv4()),
        "ipaddress.IPv6Interface" => text.and_then(parse_iface).is_some_and(|i| i.addr.is_ipv6()),
        "ipaddress.IPv4Network" => text
            .and_then(parse_network)
            .is_some_and(|i| i.addr.is_ipv4()),
        "ipaddress.IPv6Network" => text
            .and_then(parse_network)
            .is_some_and(|i| i.addr.is_ipv6()),
        "pydantic.IPvAnyAddress" => text.and_then(parse_addr).is_some(),
        "pydantic.IPvAnyInterface" => text.and_then(parse_iface).is_some(),
        "pydantic.IPvAnyNetwork" => text.and_then(parse_network).is_some(),
        "uuid.UUID" => text.is_some_and(valid_uuid),
        "pydantic.EmailStr" => text.is_some_and(valid_email),
        "pydantic.NameEmail" => text.is_some_and(|t| match (t.find('<'), t.rfind('>')) {
            (Some(a), Some(b)) if a < b => valid_email(t[a + 1..b].trim()),
            _ => valid_email(t),
        }),
        "pydantic.AnyUrl" => text.is_some_and(|t| valid_url(t, false)),
        "pydantic.AnyHttpUrl" | "pydantic.HttpUrl" => text.is_some_and(|t| valid_url(t, true)),
        "pydantic.PositiveInt" => {
            matches!(v, Value::Int(_) | Value::BigInt(_)) && v.as_f64().is_some_and(|x| x > 0.0)
        }
        "pydantic.NegativeInt" => {
            matches!(v, Value::Int(_) | Value::BigInt(_)) && v.as_f64().is_some_and(|x| x < 0.0)
        }
        "pydantic.PositiveFloat" => v.as_f64().is_some_and(|x| x > 0.0),
        "pydantic.NegativeFloat" => v.as_f64().is_some_and(|x| x < 0.0),
        "pydantic.StrictStr" | "str" => text.is_some(),
        "pydantic.StrictInt" | "int" => matches!(v, Value::Int(_) | Value::BigInt(_)),
        "pydantic.StrictBool" | "bool" => matches!(v, Value::Bool(_)),
        "pydantic.conint" => {
            matches!(v, Value::Int(_) | Value::BigInt(_)) && v.as_f64().is_some_and(num_ok)
        }
        "pydantic.confloat" | "pydantic.condecimal" => v.as_f64().is_some_and(num_ok),
        "pydantic.constr" => {
            let Some(t) = text else { return false };
            let n = t.chars().count() as f64;
            if num_param(params, "min_length").is_some_and(|m| n < m)
                || num_param(params, "max_length").is_some_and(|m| n > m)
            {
                return false;
            }
            let pattern = match params {
                Value::Dict(d) => d
                    .get("regex")
                    .or_else(|| d.get("pattern"))
                    .and_then(|r| r.as_str().map(str::to_string)),
                _ => None,
            };
            match pattern {
                Some(p) => fancy_regex::Regex::new(&format!("^(?:{p})"))
                    .is_ok_and(|r| r.is_match(t).unwrap_or(false)),
                None => true,
            }
        }
        _ => false,
    }
}

pub fn plugins() -> Vec<PluginDef> {
    vec![
        PluginDef {
            namespace: "std",
            name: "validate_type",
            params: vec![
                req("fq_type_name", "string"),
                req("value", "any"),
                opt("validation_parameters", "dict", Default::Null),
            ],
            var_kwargs: false,
            allow_unknown: false,
            returns: "bool",
            func: |_, a| {
                Ok(Value::Bool(validate_type(
                    s(a, 0),
                    &a.values[1],
                    &a.values[2],
                )))
            },
        },
        PluginDef {
            namespace: "std",
            name: "prefixlength_to_netmask",
            params: vec![req("prefixlen", "int")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "std::ipv4_address",
            func: |_, a| {
                let n = match &a.values[0] {
                    Value::Int(i) if (0..=32).contains(i) => *i as u32,
                    _ => {
                        return Err(fail(
                            a,
                            "std::prefixlength_to_netmask",
                            "ValueError: invalid prefix length",
                        ));
                    }
                };
                let i = Iface {
                    addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    prefix: n,
                };
                Ok(Value::string(u128_ip(i.mask(), true).to_string()))
            },
        },
        PluginDef {
            namespace: "std",
            name: "prefixlen",
            params: vec![req("addr", "std::ipv_any_interface")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "int",
            func: |_, a| match parse_iface(s(a, 0)) {
                Some(i) => Ok(Value::Int(i.prefix as i64)),
                None => Err(fail(a, "std::prefixlen", "ValueError: not an interface")),
            },
        },
        PluginDef {
            namespace: "std",
            name: "network_address",
            params: vec![req("addr", "std::ipv_any_interface")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "std::ipv_any_address",
            func: |_, a| match parse_iface(s(a, 0)) {
                Some(i) => Ok(Value::string(
                    u128_ip(i.network(), i.addr.is_ipv4()).to_string(),
                )),
                None => Err(fail(
                    a,
                    "std::network_address",
                    "ValueError: not an interface",
                )),
            },
        },
        PluginDef {
            namespace: "std",
            name: "netmask",
            params: vec![req("addr", "std::ipv_any_interface")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "std::ipv_any_address",
            func: |_, a| match parse_iface(s(a, 0)) {
                Some(i) => Ok(Value::string(
                    u128_ip(i.mask(), i.addr.is_ipv4()).to_string(),
                )),
                None => Err(fail(a, "std::netmask", "ValueError: not an interface")),
            },
        },
        PluginDef {
            namespace: "std",
            name: "ipindex",
            params: vec![
                req("addr", "std::ipv_any_network"),
                req("position", "int"),
                opt("keep_prefix", "bool", Default::Bool(false)),
            ],
            var_kwargs: false,
            allow_unknown: false,
            returns: "string",
            func: |_, a| {
                let Some(net) = parse_network(s(a, 0)) else {
                    return Err(fail(a, "std::ipindex", "ValueError: not a network"));
                };
                let size: u128 = if net.bits() - net.prefix >= 128 {
                    u128::MAX
                } else {
                    1u128 << (net.bits() - net.prefix)
                };
                let pos = match &a.values[1] {
                    Value::Int(i) => *i as i128,
                    _ => 0,
                };
                let idx = if pos < 0 { size as i128 + pos } else { pos };
                if idx < 0 || idx as u128 >= size {
                    return Err(fail(a, "std::ipindex", "IndexError: address out of range"));
                }
                let addr = u128_ip(net.network() + idx as u128, net.addr.is_ipv4());
                Ok(Value::string(if matches!(a.values[2], Value::Bool(true)) {
                    format!("{addr}/{}", net.prefix)
                } else {
                    addr.to_string()
                }))
            },
        },
        PluginDef {
            namespace: "std",
            name: "add_to_ip",
            params: vec![req("addr", "std::ipv_any_address"), req("n", "int")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "std::ipv_any_address",
            func: |_, a| {
                let Some(addr) = parse_addr(s(a, 0)) else {
                    return Err(fail(a, "std::add_to_ip", "ValueError: not an address"));
                };
                let n = match &a.values[1] {
                    Value::Int(i) => *i as i128,
                    _ => 0,
                };
                let max: i128 = if addr.is_ipv4() {
                    u32::MAX as i128
                } else {
                    i128::MAX
                };
                let v = ip_u128(addr) as i128 + n;
                if v < 0 || v > max {
                    return Err(fail(
                        a,
                        "std::add_to_ip",
                        "AddressValueError: result out of range",
                    ));
                }
                Ok(Value::string(
                    u128_ip(v as u128, addr.is_ipv4()).to_string(),
                ))
            },
        },
        PluginDef {
            namespace: "std",
            name: "ip_address_from_interface",
            params: vec![req("ip_interface", "std::ipv_any_interface")],
            var_kwargs: false,
            allow_unknown: false,
            returns: "std::ipv_any_address",
            func: |_, a| match parse_iface(s(a, 0)) {
                Some(i) => Ok(Value::string(i.addr.to_string())),
                None => Err(fail(
                    a,
                    "std::ip_address_from_interface",
                    "ValueError: not an interface",
                )),
            },
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks() {
        assert!(parse_network("10.0.0.0/8").is_some());
        assert!(parse_network("10.0.0.1/8").is_none());
        assert!(parse_iface("10.0.0.1/255.255.255.0").is_some_and(|i| i.prefix == 24));
        assert!(validate_type(
            "ipaddress.IPv4Address",
            &Value::str("1.2.3.4"),
            &Value::Null
        ));
        assert!(!validate_type(
            "ipaddress.IPv4Address",
            &Value::str("1.2.3"),
            &Value::Null
        ));
        assert!(validate_type(
            "datetime.date",
            &Value::str("2024-02-29"),
            &Value::Null
        ));
        assert!(!validate_type(
            "datetime.date",
            &Value::str("2023-02-29"),
            &Value::Null
        ));
    }
}
