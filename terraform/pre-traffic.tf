# Before the `live` alias moves to a newly published version, that version answers a canned
# AdmissionReview (pre-traffic-event.json: an ALB event, through the path token, for a pod that
# asks for nothing) with status 200, the review's uid and `allowed: true`. Otherwise the apply
# stops here and the endpoint keeps invoking the version it invoked. This catches what breaks
# every admission at once: code that does not start (a wrong architecture, a configuration the
# binary refuses), a path token it does not accept, an answer it cannot form. It does not
# reach Secrets Manager (the pod asks for no secret), nor the endpoint in front of the alias.
locals {
  pre_traffic_event = file("${path.module}/pre-traffic-event.json")
  pre_traffic_uid   = jsondecode(jsondecode(local.pre_traffic_event).body).request.uid
}

resource "aws_lambda_invocation" "pre_traffic" {
  count = var.pre_traffic_check ? 1 : 0

  function_name = aws_lambda_function.this.function_name
  qualifier     = aws_lambda_function.this.version
  # The path carries the token, so the input is sensitive (in plans and in the state, as the
  # registration's URLs are).
  # A literal replace: Terraform reads a search string between slashes as a regular expression.
  input = replace(local.pre_traffic_event, "PATH_TOKEN/", var.path_token_enabled ? "${local.path_token}/" : "")
  # Each published version is invoked once, before the alias can move to it.
  triggers = { version = aws_lambda_function.this.version }

  lifecycle {
    postcondition {
      condition = (
        try(jsondecode(self.result).statusCode, 0) == 200 &&
        try(jsondecode(jsondecode(self.result).body).response.uid, "") == local.pre_traffic_uid &&
        try(jsondecode(jsondecode(self.result).body).response.allowed, false) == true
      )
      error_message = "Version ${aws_lambda_function.this.version} of ${aws_lambda_function.this.function_name} did not answer the canned AdmissionReview (terraform/pre-traffic-event.json) with status 200, its uid and allowed: true; it answered status ${try(jsondecode(self.result).statusCode, "none")}: ${try(jsondecode(jsondecode(self.result).body).response.status.message, try(jsondecode(jsondecode(self.result).body).message, "no message"))}. The `live` alias was not moved: the version it names still serves. The function's log (output log_group_name) says why; fix the artefact or the configuration and apply again (docs/deploy.md, \"Upgrade and roll back\")."
    }
  }
}
