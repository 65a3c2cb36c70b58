//! gRPC server reflection, as `grpcurl list` / `grpcurl describe` use it: the processor lists
//! its services and describes the ext_proc service from the descriptors build.rs makes from
//! proto/ (and tonic-health's).

use crate::common;

use common::Processor;
use prost::Message;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

async fn ask(port: u16, request: MessageRequest) -> MessageResponse {
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connect to the processor");
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection call")
        .into_inner();
    answers
        .message()
        .await
        .expect("an answer")
        .expect("one answer")
        .message_response
        .expect("a message")
}

#[tokio::test]
async fn reflection_lists_and_describes_the_services() {
    let processor = Processor::start(&[]);
    let MessageResponse::ListServicesResponse(list) = ask(
        processor.port(),
        MessageRequest::ListServices(String::new()),
    )
    .await
    else {
        panic!("not a service list");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "envoy.service.ext_proc.v3.ExternalProcessor",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
        ]
    );

    // `describe`: the file defining the service, with its Process method.
    let MessageResponse::FileDescriptorResponse(files) = ask(
        processor.port(),
        MessageRequest::FileContainingSymbol("envoy.service.ext_proc.v3.ExternalProcessor".into()),
    )
    .await
    else {
        panic!("not a file descriptor");
    };
    let file = prost_types::FileDescriptorProto::decode(&files.file_descriptor_proto[0][..])
        .expect("a FileDescriptorProto");
    assert_eq!(file.package(), "envoy.service.ext_proc.v3");
    let service = file
        .service
        .iter()
        .find(|s| s.name() == "ExternalProcessor")
        .expect("the service");
    let process = &service.method[0];
    assert_eq!(
        (
            process.name(),
            process.input_type(),
            process.client_streaming()
        ),
        (
            "Process",
            ".envoy.service.ext_proc.v3.ProcessingRequest",
            true
        )
    );
}
